-- Monthly customer statements: what each customer was told they spent.
SELECT customer_id,
       CAST(date_trunc('month', event_date) AS DATE) AS statement_month,
       CAST(sum(amount_usd) AS DECIMAL(18, 2)) AS statement_total_usd,
       count(*) AS txn_count
FROM {{ target }}
WHERE status <> 'declined'
GROUP BY ALL
