-- The console reads the times of its filter as its pages show times, in UTC, whatever the
-- database's or the role's TimeZone: for the rest of the transaction.
SET LOCAL TimeZone TO 'UTC'
