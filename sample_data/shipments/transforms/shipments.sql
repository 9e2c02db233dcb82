-- The team's own row-level transform from the carrier change log to mart.shipments.
SELECT
    carrier_code,
    tracking_no,
    strftime(shipped_on, '%Y-%m') AS ship_month,
    CAST(weight_g AS DOUBLE) / 1000 AS weight_kg,
    CAST(round(cost_cents / 100, 2) AS DECIMAL(12, 2)) AS cost_usd,
    service
FROM {{ source }}
