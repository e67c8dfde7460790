package localtok

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Cache keeps loaded Models by directory, so that a config reload naming
// an unchanged directory does not parse its files again (a large
// tokenizer.json takes a second or more). A directory whose files changed
// (size or modification time) is loaded anew. The zero Cache is ready.
type Cache struct {
	mu     sync.Mutex
	models map[string]cachedModel
}

type cachedModel struct {
	stamp string
	model *Model
}

// stampFiles are the files whose change makes a directory load again.
var stampFiles = [...]string{"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}

// Load returns the Model of dir, from the cache when its files are
// unchanged. Only the directories named by the latest Retain stay cached.
func (c *Cache) Load(dir string) (*Model, error) {
	stamp, err := dirStamp(dir)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	cm, ok := c.models[dir]
	c.mu.Unlock()
	if ok && cm.stamp == stamp {
		return cm.model, nil
	}
	m, err := Load(dir)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.models == nil {
		c.models = make(map[string]cachedModel)
	}
	c.models[dir] = cachedModel{stamp: stamp, model: m}
	c.mu.Unlock()
	return m, nil
}

// Retain forgets every cached directory not in dirs, so that models a
// config no longer names do not stay in memory.
func (c *Cache) Retain(dirs []string) {
	keep := make(map[string]bool, len(dirs))
	for _, d := range dirs {
		keep[d] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for d := range c.models {
		if !keep[d] {
			delete(c.models, d)
		}
	}
}

// dirStamp identifies the version of a directory's files.
func dirStamp(dir string) (string, error) {
	var stamp string
	for _, name := range stampFiles {
		fi, err := os.Stat(filepath.Join(dir, name))
		switch {
		case err == nil:
			stamp += fmt.Sprintf("%s:%d:%s;", name, fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
		case name == "tokenizer.json":
			return "", fmt.Errorf("tokenizer directory %s: %w", dir, err)
		}
	}
	return stamp, nil
}
