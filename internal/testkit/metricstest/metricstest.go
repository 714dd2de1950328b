// Package metricstest scrapes and reads Prometheus metrics in tests.
package metricstest

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are scraped metric families by name.
type Families map[string]*dto.MetricFamily

// Scrape GETs url (a /metrics endpoint) in the text format and parses it.
func Scrape(ctx context.Context, url string) (Families, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", url, err)
	}
	return fams, nil
}

// FromGathered indexes what a registry's Gather returned.
func FromGathered(fams []*dto.MetricFamily) Families {
	out := Families{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// Value sums the values of the samples of family name whose labels
// include every pair of labels: a gauge's or a counter's value, a
// histogram's sample count. ok is false when no sample matches.
func (f Families) Value(name string, labels map[string]string) (v float64, ok bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
next:
	for _, m := range fam.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, want := range labels {
			if have[k] != want {
				continue next
			}
		}
		ok = true
		switch {
		case m.Gauge != nil:
			v += m.Gauge.GetValue()
		case m.Counter != nil:
			v += m.Counter.GetValue()
		case m.Histogram != nil:
			v += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			v += m.Untyped.GetValue()
		}
	}
	return v, ok
}

// Describe renders the samples of the families whose names start with
// prefix, one a line, for failure messages.
func (f Families) Describe(prefix string) string {
	var lines []string
	for name, fam := range f {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		for _, m := range fam.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v, _ := Families{name: &dto.MetricFamily{Name: fam.Name, Metric: []*dto.Metric{m}}}.Value(name, nil)
			lines = append(lines, fmt.Sprintf("%s{%s} %g", name, strings.Join(ls, ","), v))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
