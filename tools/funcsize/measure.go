package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
)

// Func is one measured function declaration.
type Func struct {
	Dir        string // package directory, slash-separated
	Name       string // "F", "(T).M" or "(*T).M"
	File       string // file path, slash-separated
	Line       int    // line of the func keyword
	Lines      int    // lines from the func keyword to the closing brace
	Complexity int    // cyclomatic complexity, as gocyclo computes it
}

// Key identifies a function in the allowlist.
func (f Func) Key() string { return f.Dir + " " + f.Name }

// Limits are the largest allowed size and complexity.
type Limits struct {
	Lines      int
	Complexity int
}

// Violates reports whether f is over either limit.
func (l Limits) Violates(f Func) bool {
	return f.Lines > l.Lines || f.Complexity > l.Complexity
}

// Measure parses every product Go file under the roots and returns its
// function declarations, sorted by directory and name.
func Measure(roots []string) ([]Func, error) {
	var funcs []Func
	fset := token.NewFileSet()
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path != root && skipDir(d.Name()) {
					return filepath.SkipDir
				}
				return nil
			}
			if !isProductFile(d.Name()) {
				return nil
			}
			fs, err := measureFile(fset, path)
			if err != nil {
				return err
			}
			funcs = append(funcs, fs...)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("funcsize: walk %s: %w", root, err)
		}
	}
	sort.Slice(funcs, func(i, j int) bool {
		if funcs[i].Dir != funcs[j].Dir {
			return funcs[i].Dir < funcs[j].Dir
		}
		if funcs[i].Name != funcs[j].Name {
			return funcs[i].Name < funcs[j].Name
		}
		return funcs[i].File < funcs[j].File
	})
	return funcs, nil
}

func skipDir(name string) bool {
	return name == "testdata" || name == "vendor" ||
		strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

func isProductFile(name string) bool {
	return strings.HasSuffix(name, ".go") &&
		!strings.HasSuffix(name, "_test.go") &&
		!strings.HasSuffix(name, ".pb.go")
}

// measureFile returns the function declarations of one file, or none if
// the file is generated.
func measureFile(fset *token.FileSet, path string) ([]Func, error) {
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil, fmt.Errorf("funcsize: %w", err)
	}
	if ast.IsGenerated(f) {
		return nil, nil
	}
	dir := filepath.ToSlash(filepath.Dir(path))
	var funcs []Func
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		start := fset.Position(fd.Pos())
		end := fset.Position(fd.End())
		funcs = append(funcs, Func{
			Dir:        dir,
			Name:       funcName(fd),
			File:       filepath.ToSlash(path),
			Line:       start.Line,
			Lines:      end.Line - start.Line + 1,
			Complexity: Complexity(fd),
		})
	}
	return funcs, nil
}

// funcName spells a declaration as gocyclo does: "F", "(T).M", "(*T).M";
// type parameters of the receiver are dropped.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	return "(" + recvString(fd.Recv.List[0].Type) + ")." + fd.Name.Name
}

func recvString(x ast.Expr) string {
	switch t := x.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.StarExpr:
		return "*" + recvString(t.X)
	case *ast.IndexExpr:
		return recvString(t.X)
	case *ast.IndexListExpr:
		return recvString(t.X)
	case *ast.ParenExpr:
		return recvString(t.X)
	}
	return "?"
}

// Complexity is the cyclomatic complexity of n as gocyclo v0.6.0 counts
// it: 1 plus one for each if, for, range, non-default case or select
// clause, && and ||.
func Complexity(n ast.Node) int {
	c := 1
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}
