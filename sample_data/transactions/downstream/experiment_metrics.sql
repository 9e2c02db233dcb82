-- Experiment readout: customers are assigned to arms by id parity.
SELECT CASE WHEN customer_id % 2 = 0 THEN 'control' ELSE 'treatment' END AS arm,
       count(DISTINCT customer_id) AS customers,
       count(*) AS txn_count,
       CAST(avg(amount_usd) AS DECIMAL(18, 4)) AS avg_txn_usd,
       CAST(sum(amount_usd) AS DECIMAL(18, 2)) AS revenue_usd
FROM {{ target }}
WHERE status = 'settled'
GROUP BY 1
