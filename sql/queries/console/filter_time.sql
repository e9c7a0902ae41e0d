-- A time of the console's filter ("dead since", "dead before") as an instant, after utc.sql (a
-- time without a zone is UTC, as the pages show times). $1: any text PostgreSQL reads as a
-- timestamptz; or $2: that many seconds before the database's clock ("10 minutes ago"); or $3: a
-- time of day, in seconds after midnight UTC ("04:29"), the last one not after the clock.
SELECT CASE
         WHEN $2::float8 IS NOT NULL THEN clock_timestamp() - make_interval(secs => $2::float8)
         WHEN $3::float8 IS NOT NULL THEN (
           SELECT CASE WHEN at > clock_timestamp() THEN at - interval '1 day' ELSE at END
           FROM (SELECT date_trunc('day', clock_timestamp()) + make_interval(secs => $3::float8) AS at) d)
         ELSE $1::text::timestamptz
       END AS at
