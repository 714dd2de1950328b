package bench

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestMedianAndPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100..1, unsorted
	}
	cases := []struct {
		name        string
		samples     []time.Duration
		median, p99 time.Duration
	}{
		{name: "none", samples: nil, median: 0, p99: 0},
		{name: "odd count", samples: ms(5, 1, 3), median: 3 * time.Millisecond, p99: 5 * time.Millisecond},
		{name: "even count", samples: ms(4, 1, 3, 2), median: 2500 * time.Microsecond, p99: 4 * time.Millisecond},
		{name: "hundred", samples: ms(hundred...), median: 50500 * time.Microsecond, p99: 99 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			must.Eq(t, c.median, Median(c.samples))
			must.Eq(t, c.p99, Percentile(c.samples, 99))
		})
	}
}
