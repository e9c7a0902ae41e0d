-- pgbench script: one writer transaction = one business row + one outbox row about it.
\set customer random(1, 5000)
\set amount random(100, 100000)
BEGIN;
INSERT INTO bench_orders (customer_id, amount_cents, status) VALUES (:customer, :amount, 'new');
INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', currval('bench_orders_id_seq')::text, 'order.created',
        jsonb_build_object('order_id', currval('bench_orders_id_seq'), 'customer_id', :customer,
                           'amount_cents', :amount, 'currency', 'EUR', 'status', 'new',
                           'note', 'standard shipping, leave at the door'));
END;
