// Package experiment runs the experiments of the attn command as library
// calls: the shared pieces of the commands (mechanism settings from the
// command line, texts scored over sliding windows) and, above package
// eval, the engines that produce its results.
package experiment
