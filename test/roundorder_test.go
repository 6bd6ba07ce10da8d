package test

import (
	"slices"
	"testing"
)

// TestRoundOrder_IsBalanced: over one period of rounds (m, or 2m for odd
// m) every round is a permutation of the m implementations, each comes
// first equally often, and each ordered pair of implementations is
// adjacent equally often. The order it replaced started rounds 1 and 2
// with the same implementation, and had tenure run first in 2 of 3.
func TestRoundOrder_IsBalanced(t *testing.T) {
	for m := 1; m <= 7; m++ {
		period := m
		if m%2 == 1 {
			period = 2 * m
		}
		first := make([]int, m)
		pairs := map[[2]int]int{}
		for r := range period {
			row := roundOrder(m, r)
			sorted := slices.Sorted(slices.Values(row))
			for i, v := range sorted {
				if v != i {
					t.Fatalf("m=%d round %d: %v is not a permutation of 0..%d", m, r, row, m-1)
				}
			}
			first[row[0]]++
			for k := 1; k < m; k++ {
				pairs[[2]int{row[k-1], row[k]}]++
			}
		}
		for i, n := range first {
			if n != period/m {
				t.Errorf("m=%d: implementation %d first in %d of %d rounds, want %d", m, i, n, period, period/m)
			}
		}
		want := period / m // each of the m(m-1) ordered pairs, over period(m-1) adjacencies
		for i := range m {
			for j := range m {
				if i != j && pairs[[2]int{i, j}] != want {
					t.Errorf("m=%d: %d right before %d in %d rounds, want %d", m, i, j, pairs[[2]int{i, j}], want)
				}
			}
		}
		if m > 1 && roundOrder(m, 0)[0] == roundOrder(m, 1)[0] {
			t.Errorf("m=%d: rounds 1 and 2 start with the same implementation", m)
		}
	}
}
