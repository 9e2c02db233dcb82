-- Row-level transform from the change log to analytics.transactions.
-- Schema v1 (before the 2024-04-01 cut-over) carries integer cents and no currency;
-- schema v2 carries decimal amounts in the event's currency.
SELECT
    txn_id,
    account_id,
    customer_id,
    merchant_id,
    event_ts,
    CAST(event_ts AS DATE) AS event_date,
    CAST(
        CASE
            WHEN schema_version = 1 THEN amount / 100
            ELSE amount * CASE currency WHEN 'EUR' THEN 1.08 WHEN 'GBP' THEN 1.27 ELSE 1.00 END
        END AS DECIMAL(18, 2)
    ) AS amount_usd,
    status
FROM {{ source }}
