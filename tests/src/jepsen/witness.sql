-- The witness's schema, on top of lock-runtime's PostgreSQL fence (`INSTALL_SQL`, run first):
-- one value per lock name and the log of accepted writes. Both operations go through the
-- shipped `lock_runtime_fence(name, token)`, which refuses a token below the highest seen for
-- the name (SQLSTATE LR409) and otherwise records it, locking the name's fence row until the
-- statement's transaction ends: the log's order is the fence's order.
CREATE TABLE IF NOT EXISTS witness_values (name text PRIMARY KEY, value bigint NOT NULL);
CREATE TABLE IF NOT EXISTS witness_log (
    seq   bigserial PRIMARY KEY,
    name  text NOT NULL,
    token bigint NOT NULL,
    value bigint NOT NULL
);

CREATE OR REPLACE FUNCTION witness_read(p_name text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM lock_runtime_fence(p_name, p_token);
    RETURN COALESCE((SELECT value FROM witness_values WHERE name = p_name), 0);
END
$$;

CREATE OR REPLACE FUNCTION witness_write(p_name text, p_token bigint, p_value bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM lock_runtime_fence(p_name, p_token);
    INSERT INTO witness_values VALUES (p_name, p_value) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value;
    INSERT INTO witness_log (name, token, value) VALUES (p_name, p_token, p_value);
END
$$;
