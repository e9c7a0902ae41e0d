-- The cause of a dead letter: its error text with what differs between occurrences of one cause
-- (ids, quoted names and values, numbers) replaced by placeholders and each run of white space
-- made one space, at most 300 characters; '(no error text)' for none (NULL, empty or only white
-- space: a cause the list's filter can name, where an empty field means any). Spliced into the
-- console's statements
-- where they say error_cause(last_error), so that the list, its count, the bulk actions and the
-- groups agree on what a cause is.
coalesce(nullif(left(btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
    coalesce(last_error, ''),
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<id>', 'g'),
    '"[^"]*"|''[^'']*''', '"..."', 'g'),
    '0x[0-9a-fA-F]+', '<n>', 'g'),
    '[0-9]+', '<n>', 'g'),
    '\s+', ' ', 'g')), 300), ''), '(no error text)')
