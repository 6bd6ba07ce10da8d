package election_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
)

// Run leads until ctx ends: OnElected gets a context that ends when
// leadership can no longer be guaranteed, and OnDemoted runs after it
// returned.
func ExampleElector_Run() {
	server := electiontest.NewMemory() // etcdelect.New(client) in production
	defer server.Close()
	e, err := election.New(server.Client(), election.Config{Key: "report", Identity: "replica-1", TTL: time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close(context.Background())

	ctx, stop := context.WithCancel(context.Background())
	err = e.Run(ctx, tenure.Callbacks{
		OnElected: func(ctx context.Context, t tenure.Term) {
			fmt.Println("elected:", t)
			stop() // the service shuts down
			<-ctx.Done()
		},
		OnDemoted: func(t tenure.Term, reason error) { fmt.Println("demoted:", reason) },
	})
	fmt.Println("Run returned context.Canceled:", errors.Is(err, context.Canceled))
	// Output:
	// elected: report#1(replica-1)
	// demoted: tenure: resigned
	// Run returned context.Canceled: true
}

// TryCampaign is the cron case: lead now, or skip.
func ExampleElector_TryCampaign() {
	server := electiontest.NewMemory()
	defer server.Close()
	ctx := context.Background()
	a, _ := election.New(server.Client(), election.Config{Key: "hourly", Identity: "a", TTL: time.Second})
	defer a.Close(ctx)
	b, _ := election.New(server.Client(), election.Config{Key: "hourly", Identity: "b", TTL: time.Second})
	defer b.Close(ctx)

	if t, err := a.TryCampaign(ctx); err == nil {
		fmt.Println("a runs the report under term", t.Token)
	}
	if _, err := b.TryCampaign(ctx); errors.Is(err, tenure.ErrLocked) {
		fmt.Println("b skips:", err)
	}
	// Output:
	// a runs the report under term 1
	// b skips: tenure: held by another candidate: 1 candidate(s) ahead on "hourly"
}
