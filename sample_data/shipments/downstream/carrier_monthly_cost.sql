-- Carrier invoice reconciliation: what each carrier is owed per month.
SELECT carrier_code, ship_month, CAST(sum(cost_usd) AS DECIMAL(18, 2)) AS cost_usd, count(*) AS shipments
FROM {{ target }}
GROUP BY carrier_code, ship_month
