-- lock-runtime's fence for PostgreSQL, as a migration (sqlx, refinery, …: copy this file into your
-- migrations; `fence::postgres::INSTALL_SQL` is the same text). Idempotent: running it again is harmless.
--
-- `SELECT lock_runtime_fence(resource, token)` inside the transaction that writes `resource`:
-- raises SQLSTATE LR409 ("fenced", naming both tokens) when a newer holder already wrote with a
-- higher token, otherwise records `token` and returns it. The upsert locks the resource's fence
-- row until the transaction ends, so concurrent writers serialise on it and the stale one fails;
-- a refused transaction rolls back as a whole.
--
-- Safe from many sessions at once (replicas that install at startup): `CREATE ... IF NOT
-- EXISTS` is not safe against a concurrent create, so the script first takes a
-- transaction-scoped advisory lock (the key the backend takes to create its sequence; single
-- bigint, never one of the locks' two-int keys). It holds until the script's transaction ends:
-- send the script as one batch (tokio-postgres `batch_execute`, `sqlx::raw_sql`: one implicit
-- transaction), as a migration (which runs in one), or `psql --single-transaction -f`.
SELECT pg_advisory_xact_lock(7226519712410372941);

-- The sequence every PostgreSQL lock's fencing token is drawn from (a PostgresBackend creates it
-- too, at its first connect); `lock_in_transaction` draws from it inside the caller's transaction.
CREATE SEQUENCE IF NOT EXISTS lock_runtime_fence;

CREATE TABLE IF NOT EXISTS lock_runtime_fences (
    resource   text PRIMARY KEY,
    token      bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION lock_runtime_fence(resource text, token bigint) RETURNS bigint
LANGUAGE plpgsql AS $fence$
#variable_conflict use_variable
DECLARE
    highest bigint;
BEGIN
    IF resource IS NULL OR token IS NULL THEN
        RAISE EXCEPTION 'lock_runtime_fence: resource and token must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    INSERT INTO lock_runtime_fences AS f (resource, token) VALUES (resource, token)
    ON CONFLICT ON CONSTRAINT lock_runtime_fences_pkey
    DO UPDATE SET token = EXCLUDED.token, updated_at = now() WHERE f.token <= EXCLUDED.token
    RETURNING f.token INTO highest;
    IF highest IS NULL THEN
        SELECT f.token INTO highest FROM lock_runtime_fences AS f WHERE f.resource = resource;
        RAISE EXCEPTION 'fenced: stale token % for resource "%": a newer holder already wrote with token %',
                token, resource, highest
            USING ERRCODE = 'LR409',
                  DETAIL = format('highest=%s', highest),
                  HINT = 'this holder lost its lock; stop, and do not retry with the same token';
    END IF;
    RETURN token;
END
$fence$;
