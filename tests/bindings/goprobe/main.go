// goprobe runs inside a sandbox: it checks its own lease through the Go binding
// (leasehold.dev/leaseholdcheck) and writes what it saw to OUT as key=value lines, exactly as
// tests/bindings/sandbox_probe.py does through the Python one (see there).
//
// Usage: goprobe OUT PUBLIC_KEY NAME
package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	lh "leasehold.dev/leaseholdcheck"
)

const pollsMax = 6000 // 10 ms each

type report struct {
	keys   []string
	values map[string]string
}

func (r *report) set(k string, v interface{}) {
	if _, ok := r.values[k]; !ok {
		r.keys = append(r.keys, k)
	}
	r.values[k] = strings.ReplaceAll(fmt.Sprint(v), "\n", " ")
}

func write(path, text string) error {
	if err := os.WriteFile(path+".tmp", []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func probe(out, publicKey, name string, r *report) error {
	lease, err := lh.LeaseFromEnv()
	if err != nil {
		return err
	}
	nameEnv := lease.Name
	if nameEnv == "" {
		nameEnv = "-"
	}
	r.set("uid", os.Getuid())
	r.set("version", lh.Version())
	r.set("env_epoch", lease.Epoch)
	r.set("slot", lease.Slot)
	r.set("sandbox", lease.Sandbox)
	r.set("name_env", nameEnv)
	table, err := lh.Open("", time.Second) // "": $LEASEHOLD_SHM, the inherited descriptor
	if err != nil {
		return err
	}
	defer table.Close()
	epoch := lease.Epoch
	if epoch == 0 {
		e, ok, err := table.CurrentEpoch(lease.Slot, lease.Sandbox)
		if err != nil {
			return err
		}
		if ok {
			r.set("first_answer", e)
		} else {
			r.set("first_answer", "none")
		}
		if err := write(out+".waiting", "waiting\n"); err != nil {
			return err
		}
		for polls := 0; !ok && polls < pollsMax; polls++ {
			time.Sleep(10 * time.Millisecond)
			if e, ok, err = table.CurrentEpoch(lease.Slot, lease.Sandbox); err != nil {
				return err
			}
		}
		if !ok {
			return fmt.Errorf("not named after %d polls", pollsMax)
		}
		epoch = e
	}
	r.set("epoch", epoch)
	r.set("check", b2i(table.Check(lease.Slot, epoch)))
	r.set("check_deadline", b2i(table.CheckDeadline(lease.Slot, epoch)))
	r.set("check_next", b2i(table.Check(lease.Slot, epoch+1)))
	alive, _ := table.WriterAlive()
	r.set("writer_alive", b2i(alive))
	tokens, err := lh.OpenTokens("") // "": $LEASEHOLD_TOKENS
	if err != nil {
		return err
	}
	defer tokens.Close()
	token, err := tokens.Token(epoch)
	if err != nil {
		return err
	}
	r.set("token_bytes", len(token))
	v, err := lh.NewVerifier()
	if err != nil {
		return err
	}
	defer v.Close()
	if err := v.AddKeyFile(publicKey); err != nil {
		return err
	}
	if err := v.Verify(token, name, epoch, lease.Sandbox.String()); err != nil {
		return err
	}
	r.set("verify", "ok")
	if err := v.Verify(token, name, epoch+1, lease.Sandbox.String()); err != nil {
		r.set("verify_next", int(lh.CodeOf(err)))
	} else {
		r.set("verify_next", "ok")
	}
	return nil
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: goprobe OUT PUBLIC_KEY NAME")
		os.Exit(2)
	}
	out := os.Args[1]
	r := &report{values: map[string]string{}}
	err := probe(out, os.Args[2], os.Args[3], r)
	if err != nil {
		r.set("error", err)
	}
	r.set("done", 1)
	var b strings.Builder
	for _, k := range r.keys {
		fmt.Fprintf(&b, "%s=%s\n", k, r.values[k])
	}
	if werr := write(out, b.String()); werr != nil {
		fmt.Fprintln(os.Stderr, "goprobe:", werr)
		os.Exit(1)
	}
	if err != nil {
		os.Exit(1)
	}
}
