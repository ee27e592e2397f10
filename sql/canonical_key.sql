-- The canonical name of key $key in the dataflow order (no row: the key is not in it).
-- Table: key_order.
SELECT canonical FROM key_order WHERE name = $key
