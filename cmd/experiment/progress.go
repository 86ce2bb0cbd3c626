package experiment

// Step is what a Progress hears when a step of an experiment begins: a
// benchmark row, an accuracy point, a perplexity run.
type Step struct {
	// Label names the step ("exact n=4096 causal").
	Label string
	// Index numbers the step from 1; Total is the count of steps in the
	// run, some of which may be skipped.
	Index, Total int
	// Forecast is the forecast seconds of this step and Rest those of the
	// steps after it, within the run's budgets, from the steps measured
	// so far; negative when there is no forecast yet. A display can draw
	// the work done as the time spent against the time spent and left,
	// and the finish time as now plus what is left.
	Forecast, Rest float64
}

// Progress receives an experiment's progress, from the goroutine that
// runs it, between the calls it measures: Begin before each step, End
// after it with how it ended ("" when it ran; a skip's reason), Note for
// a line the user should read (a mechanism that falls back to exact
// attention). A nil Progress hears nothing.
type Progress interface {
	Begin(Step)
	End(note string)
	Note(line string)
}

type noProgress struct{}

func (noProgress) Begin(Step)  {}
func (noProgress) End(string)  {}
func (noProgress) Note(string) {}

func progressOr(p Progress) Progress {
	if p == nil {
		return noProgress{}
	}
	return p
}
