-- $1 = schema name; returns the statement to run (identifiers cannot be bound as parameters).
SELECT format('CREATE SCHEMA IF NOT EXISTS %I', $1::text)
