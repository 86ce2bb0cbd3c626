package attn

// Version is this module's version, reported by the command line and in
// benchmark results.
const Version = "0.1.0-dev"
