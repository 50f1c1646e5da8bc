package partition

import "github.com/jackc/pgx/v5/pgxpool"

// UncheckedManager builds a Manager without Config.Validate, so that tests can
// attack the retirement guard with the values Validate refuses.
func UncheckedManager(pool *pgxpool.Pool, cfg Config) *Manager {
	return &Manager{pool: pool, cfg: cfg.WithDefaults()}
}

// MayRetire is the retirement guard.
var MayRetire = mayRetire

// StageSQL maps each stage a run goes through after its steps to a
// statement it starts with.
var StageSQL = map[string]string{
	"plain keys": untriggeredSQL,
	"compact":    leftoverSQL,
	"compaction": pkSQL,
	"measure":    sizeSQL,
}
