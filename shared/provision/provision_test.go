package provision

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUsersValidate(t *testing.T) {
	t.Parallel()
	ok := []Users{
		{},
		{Sweeper: "idemarchive_sweeper", Reader: "idemarchive_reader", Owner: "idemarchive_owner"},
		{Reader: "_reader2"},
	}
	for _, u := range ok {
		require.NoError(t, u.Validate(), "%+v", u)
	}
	for u, want := range map[Users]string{
		{Sweeper: "Sweeper"}:                        "lowercase letters",
		{Sweeper: "a-b"}:                            "lowercase letters",
		{Sweeper: strings.Repeat("a", 64)}:          "lowercase letters",
		{Reader: "idempotency_reader"}:              "group role",
		{Owner: "rds_iam"}:                          "group role",
		{Owner: "rdsadmin"}:                         "reserved",
		{Owner: "pg_monitor"}:                       "reserved",
		{Sweeper: "same", Reader: "same"}:           "its own user",
		{Sweeper: "x; DROP TABLE idempotency_keys"}: "lowercase letters",
	} {
		err := u.Validate()
		require.ErrorContains(t, err, want, "%+v", u)
		require.True(t, errors.Is(err, ErrInvalidUser))
	}
}
