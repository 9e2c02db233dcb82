-- Revenue dashboard: settled revenue per day.
SELECT event_date, CAST(sum(amount_usd) AS DECIMAL(18, 2)) AS revenue_usd, count(*) AS txn_count
FROM {{ target }}
WHERE status = 'settled'
GROUP BY event_date
