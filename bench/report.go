package bench

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// WriteMarkdown prints the machine and one table per size.
func WriteMarkdown(w io.Writer, r *Results) {
	m := r.Machine
	fmt.Fprintf(w, "Machine: %d CPUs, %d MiB memory, %s, Linux %s, %s, %s; the run took %.0f s.\n",
		m.CPUs, m.MemoryMiB, m.ZFS, m.Kernel, m.Go, m.Date, r.Seconds)
	fmt.Fprintf(w, "Times are medians of %d plugin/floor pairs run alternately, unless marked p50/p99. Ratio is plugin/floor: for those\n"+
		"paired rows the median of the %d pairs' own ratios (robust to a floor that drifts over the run), otherwise the ratio of the figures shown.\n", r.Reps, r.Reps)
	for _, s := range r.Sizes {
		fmt.Fprintf(w, "\n### %d slots\n\n", s.Slots)
		if s.Skipped != "" {
			fmt.Fprintf(w, "Skipped: %s\n", s.Skipped)
			continue
		}
		if s.ProvisionSeconds > 0 {
			fmt.Fprintf(w, "Provisioned (first fingerprint of an empty parent) in %.1f s.\n\n", s.ProvisionSeconds)
		}
		if len(s.Rows) > 0 {
			fmt.Fprintln(w, "| measure | plugin | floor | ratio | target | result |")
			fmt.Fprintln(w, "|---|---:|---:|---:|---|---|")
			for _, row := range s.Rows {
				fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", row.Measure, value(row.Plugin, row.Unit),
					ptrValue(row.Floor, row.Unit), ratio(row.Ratio), OrDash(row.Target), Verdict(row.Verdict))
			}
		}
		if s.Cleanup != "" {
			fmt.Fprintf(w, "\nWarning: %s\n", s.Cleanup)
		}
		if s.Error != "" {
			fmt.Fprintf(w, "\nError: %s\n", s.Error)
		}
	}
	if misses := Misses(r); len(misses) > 0 {
		fmt.Fprintf(w, "\nMissed targets: %s\n", strings.Join(misses, "; "))
	} else {
		fmt.Fprintln(w, "\nEvery target met.")
	}
}

// WriteNotes prints what each row's samples were, for the record.
func WriteNotes(w io.Writer, r *Results) {
	for _, s := range r.Sizes {
		for _, row := range s.Rows {
			if row.Note != "" {
				fmt.Fprintf(w, "- %d slots, %s: %s\n", s.Slots, row.Key, row.Note)
			}
		}
	}
}

// Misses lists the rows that missed their target, and sizes that failed.
func Misses(r *Results) []string {
	var out []string
	for _, s := range r.Sizes {
		if s.Error != "" {
			out = append(out, fmt.Sprintf("%d slots: error: %s", s.Slots, s.Error))
		}
		for _, row := range s.Rows {
			if row.Verdict == "miss" {
				out = append(out, fmt.Sprintf("%d slots: %s = %s (target %s)", s.Slots, row.Measure, describe(row), row.Target))
			}
		}
	}
	return out
}

func describe(row Row) string {
	if row.Ratio != nil && row.Unit != "processes" {
		return fmt.Sprintf("%s, %s floor", value(row.Plugin, row.Unit), ratio(row.Ratio))
	}
	return value(row.Plugin, row.Unit)
}

func value(v float64, unit string) string {
	switch unit {
	case "ms":
		if v >= 100 {
			return strconv.FormatFloat(v, 'f', 0, 64) + " ms"
		}
		return strconv.FormatFloat(v, 'f', 1, 64) + " ms"
	case "processes":
		return strconv.FormatFloat(v, 'f', 0, 64)
	case "MiB":
		return strconv.FormatFloat(v, 'f', 1, 64) + " MiB"
	}
	return strconv.FormatFloat(v, 'g', 4, 64) + " " + unit
}

func ptrValue(v *float64, unit string) string {
	if v == nil {
		return "—"
	}
	return value(*v, unit)
}

func ratio(r *float64) string {
	if r == nil {
		return "—"
	}
	return strconv.FormatFloat(*r, 'f', 2, 64) + "×"
}

// Verdict is a row's verdict as a table shows it: a miss in bold.
func Verdict(v string) string {
	switch v {
	case "pass":
		return "pass"
	case "miss":
		return "**miss**"
	}
	return v
}

// OrDash is s, or a dash when s is empty.
func OrDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}
