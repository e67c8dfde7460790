package fleetsim

import (
	"fmt"
	"math"
)

// calibration is, formatted, the median |predicted − observed| ÷ observed time to
// first token over the llm decisions that made a prediction.
func calibration(r Result) string {
	if len(r.Predicted) == 0 {
		return ""
	}
	rel := make([]float64, 0, len(r.Predicted))
	for i, p := range r.Predicted {
		if o := r.Observed[i]; o > 0 {
			rel = append(rel, math.Abs(p-o)/o)
		}
	}
	return fmt.Sprintf("%.2f", quantile(rel, 0.5))
}
