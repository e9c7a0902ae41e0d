-- The cause of a dead letter ($1: its last_error): its error text with what differs between
-- occurrences of one cause (ids, quoted names and values, numbers) replaced by placeholders and
-- each run of white space made one space, at most 300 characters; '(no error text)' for none
-- (NULL, empty or only white space: a cause the list's filter can name, where an empty field means
-- any). The expression between the error_cause.sql markers is written out, exactly as here, in
-- each console statement that computes a cause (the filter, the causes), so that the list, its
-- count, the bulk actions and the groups agree on what a cause is; a unit test keeps the copies
-- equal (console::queries).
SELECT /* error_cause.sql */ (coalesce(nullif(left(btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
    coalesce(last_error, ''),
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<id>', 'g'),
    '"[^"]*"|''[^'']*''', '"..."', 'g'),
    '0x[0-9a-fA-F]+', '<n>', 'g'),
    '[0-9]+', '<n>', 'g'),
    '\s+', ' ', 'g')), 300), ''), '(no error text)')) /* end error_cause.sql */ AS cause
FROM (SELECT $1::text AS last_error) AS e
