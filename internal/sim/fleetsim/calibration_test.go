package fleetsim

import (
	"fmt"
	"math"
)

// calibration is the median |predicted − observed| ÷ observed time to
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
	return fmt.Sprintf("median |pred-obs|/obs %.2f (n=%d)", quantile(rel, 0.5), len(rel))
}
