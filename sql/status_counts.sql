-- Rows per status.
SELECT status, count(*) AS rows FROM key_data GROUP BY status ORDER BY status
