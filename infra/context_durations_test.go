package main

import "testing"

// Context durations are read as the functions read their variables: a
// nonzero value shorter than a nanosecond is refused, so that for the props
// whose zero means something a typo such as 0.1ns never becomes "no fixed pause"
// or "no grace".
func TestASubNanosecondContextDurationIsNotSilentlyZero(t *testing.T) {
	for _, name := range []string{"sweepPause", "sweepInFlightGrace"} {
		p, _, err := propsFromContext(contextOf(map[string]any{name: "0.1ns"}))
		if err == nil {
			v := p.SweepPause
			if name == "sweepInFlightGrace" {
				v = p.SweepInFlightGrace
			}
			t.Errorf("context %s=0.1ns accepted as %v (shared/settings refuses it: \"is not 0 but shorter than a nanosecond\")", name, *v)
		}
	}
}
