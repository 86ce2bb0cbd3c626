package registry

import (
	"github.com/attnkit/attn"
	"github.com/attnkit/attn/magicpig"
	"github.com/attnkit/attn/quest"
)

// The decoders that read a fraction of the cache. Their Forward, the
// prefill rule they assume, is exact attention (they say so through
// attn.Fallbacker), and so is their backward pass; they approximate in
// decoding only.
func init() {
	entries = append(entries,
		Entry{
			Name:    "quest",
			Summary: "Quest: exact prefill, then decoding over the top pages by min/max key bounds, plus sinks and a recent window (package quest)",
			Params: []Param{
				intParam("page", quest.DefaultPage, 1, quest.MaxPage, "positions per page, each summarised by its keys' channel-wise min and max"),
				intParam("budget", quest.DefaultBudget, 0, quest.MaxTokens, "tokens of chosen pages each query head picks (budget/page pages), on top of the sinks and the recent window; 0: none"),
				intParam("sinks", quest.DefaultSinks, 0, quest.MaxTokens, "first positions always attended (tokens)"),
				intParam("recent", quest.DefaultRecent, 0, quest.MaxTokens, "last positions always attended (tokens); the query's own page always is"),
				enumParam("group", quest.GroupMax.String(), []string{quest.GroupMax.String(), quest.GroupUnion.String()},
					"how a GQA group shares pages: max (a page scored by its best head, the budget for the group), or union of its heads' picks (up to H/Hkv budgets)"),
			},
			Causal:   true,
			Decode:   true,
			Backward: true,
			Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
				var cfg quest.Config
				var err error
				if cfg.Page, err = p.Int("page"); err != nil {
					return nil, err
				}
				if cfg.Budget, err = p.Int("budget"); err != nil {
					return nil, err
				}
				if cfg.Sinks, err = p.Int("sinks"); err != nil {
					return nil, err
				}
				if cfg.Recent, err = p.Int("recent"); err != nil {
					return nil, err
				}
				group, err := p.String("group")
				if err != nil {
					return nil, err
				}
				if group == quest.GroupUnion.String() {
					cfg.Group = quest.GroupUnion
				}
				// 0 on the command line means none; in Config 0 is the
				// default and a negative value none.
				for _, f := range []*int{&cfg.Budget, &cfg.Sinks, &cfg.Recent} {
					if *f == 0 {
						*f = -1
					}
				}
				return quest.New(cfg)
			},
		},
		Entry{
			Name:    "magicpig",
			Summary: "MagicPIG: exact prefill, then decoding by SimHash sampling with importance weights, merged with sinks and a window; tables from -seed (package magicpig)",
			Params: []Param{
				intParam("bits", magicpig.DefaultBits, 0, magicpig.MaxBits, "K, hyperplanes per table (2^K buckets); 0: every key is sampled, exact"),
				intParam("tables", magicpig.DefaultTables, 1, magicpig.MaxTables, "L, hash tables; tables·2^bits at most 2^20"),
				intParam("threshold", magicpig.DefaultThreshold, 1, magicpig.MaxTables, "tables a key must share the query's bucket in to be sampled, at most tables"),
				intParam("sinks", magicpig.DefaultSinks, 0, magicpig.MaxTokens, "first positions always attended (tokens)"),
				intParam("window", magicpig.DefaultWindow, 1, magicpig.MaxTokens, "last positions always attended (tokens), the query's own included"),
			},
			Causal:   true,
			Decode:   true,
			Backward: true,
			Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
				cfg := magicpig.Config{Seed: seed}
				var err error
				if cfg.Bits, err = p.Int("bits"); err != nil {
					return nil, err
				}
				if cfg.Tables, err = p.Int("tables"); err != nil {
					return nil, err
				}
				if cfg.Threshold, err = p.Int("threshold"); err != nil {
					return nil, err
				}
				if cfg.Sinks, err = p.Int("sinks"); err != nil {
					return nil, err
				}
				if cfg.Window, err = p.Int("window"); err != nil {
					return nil, err
				}
				for _, f := range []*int{&cfg.Bits, &cfg.Sinks} {
					if *f == 0 {
						*f = -1
					}
				}
				return magicpig.New(cfg)
			},
		},
	)
}
