package quest

import (
	"context"
	"fmt"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// Defaults of Config: the paper's page size; a budget, sinks and recent
// window of the sizes its evaluation and StreamingLLM use.
const (
	DefaultPage   = 16
	DefaultBudget = 2048
	DefaultSinks  = 4
	DefaultRecent = 64
)

// MaxPage bounds Config.Page, and MaxTokens Budget, Sinks and Recent:
// far past any context, small enough that no size derived from them
// overflows.
const (
	MaxPage   = 1 << 16
	MaxTokens = attn.MaxElems
)

// Group says how the query heads of a GQA group share the pages they
// read; see the package documentation.
type Group int

const (
	// GroupMax scores a page by the largest of its heads' scores.
	GroupMax Group = iota
	// GroupUnion attends each group to the union of its heads' choices.
	GroupUnion
)

func (g Group) String() string {
	switch g {
	case GroupUnion:
		return "union"
	case GroupMax:
		return "max"
	}
	return fmt.Sprintf("Group(%d)", int(g))
}

// Config holds Quest's parameters. The zero value is the defaults: pages
// of 16, a budget of 2048 tokens, 4 sinks, a recent window of 64, each
// group's pages scored by the best of its heads.
type Config struct {
	// Page is the number of positions per page (default DefaultPage).
	Page int
	// Budget is the number of tokens of chosen pages each query head
	// picks, Budget/Page pages, on top of the sinks and the recent
	// window (default DefaultBudget). A negative Budget picks none: the
	// rule is then StreamingLLM's.
	Budget int
	// Sinks is the number of first positions always attended (default
	// DefaultSinks); negative means none.
	Sinks int
	// Recent is the number of last positions always attended (default
	// DefaultRecent), the query's own included; negative means none
	// beyond the query's own page, which is always attended.
	Recent int
	// Group selects how a GQA group shares its pages (default
	// GroupMax).
	Group Group
}

// Quest is the mechanism: exact attention in Forward and in prompt
// chunks, Quest's page selection in decoding. It implements
// attn.Mechanism under the name "quest", attn.Decodable, attn.Fallbacker
// and attn.Differentiable, and is safe for concurrent use.
type Quest struct {
	page, budget, sinks, recent int
	group                       Group
	kn                          *flash.Kernel
}

// New returns Quest with the parameters of cfg, or an error wrapping
// attn.ErrInput if one is out of range.
func New(cfg Config) (*Quest, error) {
	m := &Quest{page: cfg.Page, budget: cfg.Budget, sinks: cfg.Sinks, recent: cfg.Recent, group: cfg.Group, kn: flash.New(flash.Config{})}
	if m.page == 0 {
		m.page = DefaultPage
	}
	if m.budget == 0 {
		m.budget = DefaultBudget
	}
	if m.sinks == 0 {
		m.sinks = DefaultSinks
	}
	if m.recent == 0 {
		m.recent = DefaultRecent
	}
	m.budget, m.sinks, m.recent = max(m.budget, 0), max(m.sinks, 0), max(m.recent, 0)
	switch {
	case m.page < 1 || m.page > MaxPage:
		return nil, fmt.Errorf("%w: quest: Page = %d, want 1 to %d", attn.ErrInput, cfg.Page, MaxPage)
	case m.budget > MaxTokens || m.sinks > MaxTokens || m.recent > MaxTokens:
		return nil, fmt.Errorf("%w: quest: Budget = %d, Sinks = %d, Recent = %d: at most %d tokens", attn.ErrInput, cfg.Budget, cfg.Sinks, cfg.Recent, MaxTokens)
	case m.group != GroupUnion && m.group != GroupMax:
		return nil, fmt.Errorf("%w: quest: unknown group rule %v", attn.ErrInput, cfg.Group)
	}
	return m, nil
}

// Name returns "quest".
func (*Quest) Name() string { return "quest" }

// Config returns the configuration in effect, defaults filled in; a part
// that is off (no budget, sinks or recent window) reads -1.
func (m *Quest) Config() Config {
	c := Config{Page: m.page, Budget: m.budget, Sinks: m.sinks, Recent: m.recent, Group: m.group}
	for _, f := range []*int{&c.Budget, &c.Sinks, &c.Recent} {
		if *f == 0 {
			*f = -1
		}
	}
	return c
}

// Forward is exact attention (package flash): Quest's prefill rule.
func (m *Quest) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	return m.kn.Forward(ctx, s, q, k, v, o, out, lse)
}

// Fallback says that Forward is exact attention, for every call: Quest
// approximates in decoding only.
func (m *Quest) Fallback(s attn.Shape, o attn.Options) string {
	return "quest approximates only in decoding; Forward, the prefill rule, is exact attention"
}

// Backward is the gradient of Forward, exact attention (package flash).
func (m *Quest) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	return m.kn.Backward(ctx, s, q, k, v, out, lse, dout, o, nil, dq, dk, dv)
}

var (
	_ attn.Mechanism      = (*Quest)(nil)
	_ attn.Decodable      = (*Quest)(nil)
	_ attn.Fallbacker     = (*Quest)(nil)
	_ attn.Differentiable = (*Quest)(nil)
)
