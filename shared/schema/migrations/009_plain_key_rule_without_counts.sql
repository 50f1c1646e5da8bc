-- idempotency_key_has_time once more, cheaper again: the plain-key trigger
-- asks it of every row a sweep batch archives, and under migration 007 it was
-- still about half of the trigger's cost (17-27 ms of a 10,000-row batch on 2
-- cores, a third of the keys each ULID, UUIDv7 and plain).
--
-- What cost: counted repetition. PostgreSQL's regex engine builds a state for
-- every repeated atom ('{25}' is 25 states, the UUID's pattern 32), and it
-- builds the DFA lazily on every match, so a pattern's cost grows with its
-- count of states. A '+' is one state. This version keeps migration 007's
-- dispatch on the length of the last ':'-separated segment and replaces each
-- count with '+', pinning the positions the counts fixed with LIKE, which
-- matches '_' (any one character) without the regex engine: about half the
-- time over the same keys.
--
-- Why this is the same rule (the invariant every plain-key entry depends on;
-- FuzzKeyTimeRuleMatchesSQL holds it against keytime.FromKey and against
-- migration 006's pattern):
--   - ULID, 26 characters: '^[0-7]C+$' matches a 26-character string exactly
--     when its first character is in [0-7] and the 25 others are all in C,
--     which is what '^[0-7]C{25}$' says.
--   - UUIDv7, 36 characters: H is the hexadecimal class, which holds no '-'.
--     '^H+-H+-7H+-[89ABab]H+-H+$' matches a string with exactly four '-', each
--     followed by a non-empty run of H, the second by '7' and the third by a
--     variant character. The LIKE pattern puts a '-' at positions 9, 14, 19
--     and 24 and a '7' at 15. Both together: the four '-' are exactly those
--     four, so the runs have 8, 4, 4, 4 and 12 characters, starting with '7'
--     at 15 and the variant at 20 and all else in H: the string
--     'H{8}-H{4}-7H{3}-[89ABab]H{3}-H{12}' describes, and no other.
--   length(), LIKE's '_' and the regex all count characters, not bytes, so a
--   multibyte character counts once in each (and matches no class).
CREATE OR REPLACE FUNCTION idempotency_key_has_time(scoped_key text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE length(split_part(scoped_key, ':', -1))
       WHEN 26 THEN split_part(scoped_key, ':', -1) ~ '^[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]+$'
       WHEN 36 THEN split_part(scoped_key, ':', -1) LIKE '________-____-7___-____-____________'
                    AND split_part(scoped_key, ':', -1) ~ '^[0-9A-Fa-f]+-[0-9A-Fa-f]+-7[0-9A-Fa-f]+-[89ABab][0-9A-Fa-f]+-[0-9A-Fa-f]+$'
       ELSE CASE WHEN scoped_key IS NULL THEN NULL ELSE false END
       END
$$;
