-- Regulatory extract: every transaction of 10,000 USD or more.
SELECT txn_id, account_id, customer_id, event_date, amount_usd
FROM {{ target }}
WHERE amount_usd >= 10000
