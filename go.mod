module github.com/attnkit/attn

go 1.26
