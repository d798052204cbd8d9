-- Who decided (issue 51): an approval's audit row names the API token the decision was
-- made with (`cairn tokens`; NULL: none, the server's CAIRN_API_TOKEN, or a Client or the
-- CLI on the database's URL) and the tenant it acted for (NULL: an admin), beside
-- decided_by, its name ("token <id>", "admin", a name given, or "rule N").
ALTER TABLE approval_decisions ADD COLUMN decided_token text;
ALTER TABLE approval_decisions ADD COLUMN decided_tenant text;
