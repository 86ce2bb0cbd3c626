package tokenizer_test

import (
	"context"
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

func ExampleTrain() {
	texts := []string{
		"the cat sat on the mat",
		"the dog sat on the log",
		"the cat and the dog",
	}
	tok, err := tokenizer.Train(context.Background(), texts, tokenizer.TrainConfig{Size: 290})
	if err != nil {
		panic(err)
	}
	// Fewer pieces than asked for: no pair is left that occurs twice.
	fmt.Println(tok.Len(), "pieces; learned first:", tok.Pieces()[259:265])
	ids := tok.Encode("the cat sat on the log!", false)
	for i, id := range ids {
		if i > 0 {
			fmt.Print(" ")
		}
		fmt.Printf("%q", tok.Piece(id))
	}
	fmt.Println()
	fmt.Printf("%q\n", tok.Decode(ids))
	// Output:
	// 285 pieces; learned first: [he ▁t ▁the at og on]
	// "▁the" "▁cat" "▁sat" "▁on" "▁the" "▁" "l" "og" "<0x21>"
	// "the cat sat on the log!"
}

func ExampleNewBPE() {
	// Pieces are written in GPT-2's byte characters ("Ġ" is a space);
	// each merge rule joins two pieces, the earlier rules first.
	pieces := []string{"h", "e", "l", "o", "Ġ", "w", "r", "d", "he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld"}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"}
	tok, err := tokenizer.NewBPE(pieces, nil, merges, "gpt-2")
	if err != nil {
		panic(err)
	}
	ids := tok.Encode("hello world", false)
	fmt.Println(ids, tok.Piece(ids[1]), tok.Decode(ids))
	// Output:
	// [11 16] Ġworld hello world
}
