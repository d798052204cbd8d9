-- The pages' sessions (`cairn serve`'s login): a random value in the browser's cookie,
-- kept here only as its SHA-256 (a stolen table opens nothing). Logging out deletes the
-- row, so a copied cookie is dead with it; revoking the token it was made from deletes
-- its sessions too (token_revoke), and a session whose token's hash no longer matches
-- what it was made from opens nothing. owner: what the session was made from, the
-- token's stored hash, or for CAIRN_API_TOKEN (token_id NULL) a MAC of it, so a server
-- started with another token opens none of the old one's sessions.
CREATE TABLE page_sessions (
    hash        bytea PRIMARY KEY,
    token_id    text REFERENCES api_tokens (id) ON DELETE CASCADE,
    owner       bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX page_sessions_token ON page_sessions (token_id) WHERE token_id IS NOT NULL;
CREATE INDEX page_sessions_expiry ON page_sessions (expires_at);
