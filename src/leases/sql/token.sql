-- A new lease token: 64 hex digits from the database's CSPRNG (two v4 UUIDs,
-- 244 random bits). Every grant of a lease (the claim, push placement) takes one.
CREATE OR REPLACE FUNCTION meshwork_new_token() RETURNS text
LANGUAGE sql VOLATILE
AS $$
  SELECT replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '')
$$;
