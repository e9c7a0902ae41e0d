-- A relay stopping cleanly takes its row out of outbox_relays.
DELETE FROM outbox_relays WHERE id = $1::uuid
