// Package docblocks reads the shell examples of a Markdown page: its fenced
// code blocks marked sh, also those indented inside a list, so that a test
// can run exactly what a reader is told to type.
package docblocks

import (
	"fmt"
	"os"
	"strings"
)

// Block is one fenced sh block.
type Block struct {
	// Line is the line of the opening fence, from 1.
	Line int
	// Script is the block's text, its list indentation removed.
	Script string
}

// Read returns the sh blocks of the Markdown file at path, in order.
func Read(path string) ([]Block, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(string(data))
}

// Parse returns the sh blocks of a Markdown text, in order.
func Parse(text string) ([]Block, error) {
	var blocks []Block
	var cur *Block
	indent := ""
	var lines []string
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if cur == nil {
			if trimmed == "```sh" {
				cur = &Block{Line: i + 1}
				indent = line[:len(line)-len(trimmed)]
				lines = nil
			}
			continue
		}
		if trimmed == "```" {
			cur.Script = strings.Join(lines, "\n") + "\n"
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		if line != "" && !strings.HasPrefix(line, indent) {
			return nil, fmt.Errorf("line %d: the sh block of line %d is indented less than its fence", i+1, cur.Line)
		}
		lines = append(lines, strings.TrimPrefix(line, indent))
	}
	if cur != nil {
		return nil, fmt.Errorf("the sh block of line %d is never closed", cur.Line)
	}
	return blocks, nil
}
