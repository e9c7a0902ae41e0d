-- The business table of the writer benchmarks: each writer transaction inserts one order and one
-- outbox event about it.
CREATE TABLE IF NOT EXISTS bench_orders (
    id           bigserial   PRIMARY KEY,
    customer_id  int         NOT NULL,
    amount_cents bigint      NOT NULL,
    status       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
