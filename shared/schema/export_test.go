package schema

// MigrateTo is exported for the upgrade tests.
var MigrateTo = migrateTo
