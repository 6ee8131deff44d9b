module github.com/inhuman/mcp-exec/deploy/validate

go 1.26.8
