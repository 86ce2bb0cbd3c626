package tokenizer_test

import (
	"fmt"

	"github.com/attnkit/attn/model/tokenizer"
)

func Example() {
	pieces := []string{"<unk>", "<s>", "</s>", "▁", "h", "i", "hi", "▁hi", "<0x21>"}
	scores := []float32{0, 0, 0, -1, -2, -3, -4, -5, 0}
	tok, err := tokenizer.New(pieces, scores, nil)
	if err != nil {
		panic(err)
	}
	ids := tok.Encode("hi hi!", true)
	for i, id := range ids {
		if i > 0 {
			fmt.Print(" ")
		}
		fmt.Printf("%d:%q", id, tok.Piece(id))
	}
	fmt.Println()
	fmt.Printf("%q\n", tok.Decode(ids))
	// Output:
	// 1:"<s>" 7:"▁hi" 7:"▁hi" 8:"<0x21>"
	// "hi hi!"
}
