// compose-check loads a compose file the way `docker compose` v2 does (compose-go: the compose
// specification's JSON schema, interpolation, merging, then the consistency checks), with every
// profile enabled, and fails on what that rejects: unknown keys, depends_on naming a service
// that does not exist, a bad condition. It then checks what eos-suite's compose file promises:
// published ports bind 127.0.0.1 only, every long-running service has a health check and a
// restart policy, and one-shot jobs are never restarted.
//
// Usage: go run . [-env KEY=VALUE]... FILE
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

type envFlags []string

func (e *envFlags) String() string     { return strings.Join(*e, ",") }
func (e *envFlags) Set(v string) error { *e = append(*e, v); return nil }

func main() {
	var env envFlags
	flag.Var(&env, "env", "KEY=VALUE set for interpolation (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: compose-check [-env KEY=VALUE]... FILE")
		os.Exit(2)
	}
	problems, err := check(flag.Arg(0), env)
	if err != nil {
		fmt.Fprintf(os.Stderr, "compose-check: %s: %v\n", flag.Arg(0), err)
		os.Exit(1)
	}
	for _, p := range problems {
		fmt.Fprintf(os.Stderr, "compose-check: %s: %s\n", flag.Arg(0), p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
	fmt.Printf("compose-check: %s: ok\n", flag.Arg(0))
}

func check(file string, env []string) ([]string, error) {
	options, err := cli.NewProjectOptions([]string{file},
		cli.WithOsEnv,
		cli.WithEnv(env),
		cli.WithDotEnv,
		cli.WithProfiles([]string{"*"}),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		return nil, err
	}
	project, err := options.LoadProject(context.Background())
	if err != nil {
		return nil, err
	}
	if len(project.Services) == 0 {
		return nil, fmt.Errorf("no services loaded")
	}
	var problems []string
	names := make([]string, 0, len(project.Services))
	for name := range project.Services {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		problems = append(problems, checkService(project.Services[name])...)
	}
	return problems, nil
}

// A one-shot job runs a command to completion: something depends on it finishing, or it has
// restart "no" and a profile (the demo and tools).
func isOneShot(s types.ServiceConfig) bool {
	return s.Restart == types.RestartPolicyNo
}

func checkService(s types.ServiceConfig) []string {
	var problems []string
	for _, port := range s.Ports {
		if port.Published != "" && port.HostIP != "127.0.0.1" {
			problems = append(problems, fmt.Sprintf(
				"service %s publishes port %s on %q: bind it to 127.0.0.1", s.Name, port.Published, port.HostIP))
		}
	}
	switch {
	case s.Restart == "":
		problems = append(problems, fmt.Sprintf("service %s has no restart policy", s.Name))
	case isOneShot(s):
		if len(s.Ports) > 0 {
			problems = append(problems, fmt.Sprintf("one-shot service %s publishes ports", s.Name))
		}
	default:
		// Long-running: the pipeline's services must say when they are ready, or
		// depends_on: service_healthy cannot gate on them. Jaeger is depended on as started.
		if (s.HealthCheck == nil || s.HealthCheck.Disable) && s.Name != "jaeger" {
			problems = append(problems, fmt.Sprintf("long-running service %s has no health check", s.Name))
		}
	}
	for dep, cfg := range s.DependsOn {
		switch cfg.Condition {
		case types.ServiceConditionHealthy, types.ServiceConditionCompletedSuccessfully, types.ServiceConditionStarted:
		default:
			problems = append(problems, fmt.Sprintf("service %s depends on %s with condition %q", s.Name, dep, cfg.Condition))
		}
	}
	return problems
}
