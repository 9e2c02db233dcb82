-- Risk features served per account.
SELECT account_id,
       count(*) AS txn_count,
       CAST(sum(amount_usd) AS DECIMAL(18, 2)) AS total_usd,
       CAST(max(amount_usd) AS DECIMAL(18, 2)) AS max_txn_usd,
       count(*) FILTER (WHERE status = 'declined') AS declined_count
FROM {{ target }}
GROUP BY account_id
