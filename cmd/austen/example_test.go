package austen_test

import (
	"fmt"

	"github.com/attnkit/attn/cmd/austen"
)

func Example() {
	w, tok, err := austen.Load()
	if err != nil {
		fmt.Println(err)
		return
	}
	c := w.Config.WithDefaults()
	fmt.Printf("%d layers, %d query heads, %d key/value heads, context %d, %d pieces\n",
		c.Layers, c.Heads, c.KVHeads, c.SeqLen, tok.Len())
	fmt.Println(tok.Decode(tok.Encode("Anne Elliot", false)))
	// Output:
	// 4 layers, 8 query heads, 2 key/value heads, context 2048, 4096 pieces
	// Anne Elliot
}

// The long-context model is found by name, as the CLI's -model finds it.
func ExampleEmbedded() {
	load, name, ok := austen.Embedded("austen-long")
	if !ok {
		return
	}
	w, tok, err := load()
	if err != nil {
		fmt.Println(err)
		return
	}
	c := w.Config.WithDefaults()
	fmt.Printf("%s: %d layers, %d query heads, %d key/value heads, context %d, %d pieces\n",
		name, c.Layers, c.Heads, c.KVHeads, c.SeqLen, tok.Len())
	// Output:
	// austen-long (embedded): 4 layers, 4 query heads, 2 key/value heads, context 8192, 512 pieces
}
