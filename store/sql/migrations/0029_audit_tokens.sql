-- Who decided (issue 51): an approval's audit row names the API token the decision was
-- made with (`cairn tokens`; NULL: none, the server's CAIRN_API_TOKEN, or a Client or the
-- CLI on the database's URL) and the tenant it acted for (NULL: an admin), beside
-- decided_by, its name ("token <id>", "admin", a name given, or "rule N").
ALTER TABLE approval_decisions ADD COLUMN decided_token text;
ALTER TABLE approval_decisions ADD COLUMN decided_tenant text;
-- And who asked a run to stop: the first cancel's asker, kept as its reason is ("token
-- <id>", "admin", the name a Client gave); NULL: none, or its parent's cancel stopped it.
-- A name a caller gave is a user's words: a JSON string, sealed like cancel_reason (0028).
ALTER TABLE checkpoints ADD COLUMN cancelled_by jsonb;
