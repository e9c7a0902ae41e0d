SELECT pg_advisory_unlock(7250010002)
