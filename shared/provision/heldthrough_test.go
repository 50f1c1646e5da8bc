package provision

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// A function's user holding another project role through other roles is
// refused, with the shortest chain and the link to break: its first where
// the chain starts with an operator's group, the one after its own role
// where that role holds another (a project role must hold no other). A
// chain only through its own role, or through memberships that pass
// nothing on (PostgreSQL 16: INHERIT FALSE, SET FALSE, no ADMIN OPTION), is
// not. The roles are made and dropped inside one transaction: role DDL is
// cluster-wide, and other tests' deploys must never see them.
func TestAProjectRoleHeldThroughOtherRolesIsRefused(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	var v16 bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int >= 160000").Scan(&v16))
	n := func(s string) string { return s + "_" + randomName(t) }
	user, own, other, group, wide, quiet := n("fn_user"), n("own_role"), n("other_role"), n("ops"), n("wide"), n("quiet")
	type grant struct{ role, member, with string }
	for name, tc := range map[string]struct {
		grants []grant
		want   string // "" for none
	}{
		"through a group": {
			[]grant{{own, user, ""}, {other, group, ""}, {group, wide, ""}, {wide, user, ""}},
			"user " + user + " holds " + other + " through " + wide + " -> " + group + " -> " + other + ", with its privileges (a function's user holds its function's role alone): run REVOKE " + wide + " FROM " + user,
		},
		"shortest chain": {
			[]grant{{own, user, ""}, {other, group, ""}, {group, wide, ""}, {wide, user, ""}, {group, user, ""}},
			"through " + group + " -> " + other + ", with its privileges",
		},
		"through its own role": {
			[]grant{{own, user, ""}, {other, own, ""}},
			"user " + user + " holds " + other + " through " + own + " -> " + other + ", with its privileges (a function's user holds its function's role alone): run REVOKE " + other + " FROM " + own,
		},
		"its own role through a group": {
			[]grant{{own, group, ""}, {group, user, ""}},
			"",
		},
		"a membership that passes nothing on": {
			[]grant{{own, user, ""}, {other, quiet, ""}, {quiet, user, "WITH INHERIT FALSE, SET FALSE"}},
			"through " + quiet + " -> " + other, // before 16 every membership passes privileges on
		},
		"a membership with the admin option alone": {
			[]grant{{own, user, ""}, {other, quiet, ""}, {quiet, user, "WITH ADMIN TRUE, INHERIT FALSE, SET FALSE"}},
			"through " + quiet + " -> " + other,
		},
	} {
		t.Run(name, func(t *testing.T) {
			if v16 && name == "a membership that passes nothing on" {
				tc.want = ""
			}
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			for _, r := range []string{user, own, other, group, wide, quiet} {
				_, err := tx.Exec(ctx, "CREATE ROLE "+r)
				require.NoError(t, err)
			}
			for _, g := range tc.grants {
				with := g.with
				if !v16 && with != "" {
					// PostgreSQL 15 has no grant options but ADMIN.
					with = map[bool]string{true: "WITH ADMIN OPTION", false: ""}[g.with == "WITH ADMIN TRUE, INHERIT FALSE, SET FALSE"]
				}
				_, err := tx.Exec(ctx, "GRANT "+g.role+" TO "+g.member+" "+with)
				require.NoError(t, err)
			}
			err = refuseHeldThrough(ctx, tx, User{Name: user, Role: own}, []string{other})
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}
