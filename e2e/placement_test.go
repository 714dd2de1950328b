package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
)

// archivesAttr is the node attribute a job places by (docs/job-usage.md).
const archivesAttr = "${meta." + device.ArchivesMetaKey + "}"

// onArchiveOf returns job with one constraint: the node's published
// archives list group ("namespace/job/group").
func onArchiveOf(job nomadtest.JobSpec, group string) nomadtest.JobSpec {
	job.Constraints = []nomadtest.Constraint{{Attribute: archivesAttr, Operator: "set_contains", Value: group}}
	return job
}

// archivesConstraint is how Nomad names that constraint in its placement
// metrics (the constraint's LTarget, Operand and RTarget).
func archivesConstraint(group string) string {
	return archivesAttr + " set_contains " + group
}

// TestRestore_SchedulerPlacesByArchiveMeta: Nomad's scheduler places a job
// on the node that holds its archive, through the node metadata the plugin
// publishes. One Nomad cluster: a dev agent (the server, and client A on
// its own pool) and a client-only agent (client B, another pool), each
// with the plugin, and no backup_dir: the data can only come from B's own
// archive. The job, pinned to B, writes and is stopped; once B's archive
// holds its data and B's metadata (as the server sees it) lists its group,
// the same job without the pin but with a set_contains constraint on that
// metadata is placed on B (A filtered by the constraint) and starts with
// its data. A job whose group no node lists stays unplaced, its
// evaluation blocked.
func TestRestore_SchedulerPlacesByArchiveMeta(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts Nomad agents and runs jobs")
	step := stepper(t)
	clientA, clientB := twoStateClients(t, step, "", "")
	poolA, agentA, parentA := clientA.pool, clientA.agent, clientA.parent
	poolB, agentB, parentB := clientB.pool, clientB.agent, clientB.parent
	k := &keeperRuns{seen: map[string]bool{}, step: step}
	group := "default/keeper/g" // keeperJob's namespace, job and group

	// On client B, pinned: its data goes to B's archive when it stops.
	first := k.run(t, agentA, keeper("1", agentB.NodeID))
	must.EqOp(t, agentB.NodeID, first.NodeID)
	agentA.StopJob(t, "keeper", jobTimeout)
	agentA.Wait(t, "the first allocation's dataset archived on client B", releaseTimeout, func() (bool, string) {
		return archivedFor(t, poolB, parentB+"/.archive", first.ID) != "", "not archived yet"
	})
	// The server's view of each node, which is what the scheduler reads.
	listed := func(nodeID string) (bool, string) {
		n, _, err := agentA.API.Nodes().Info(nodeID, nil)
		if err != nil {
			return false, err.Error()
		}
		v := n.Meta[device.ArchivesMetaKey]
		return slices.Contains(strings.Split(v, ","), group), fmt.Sprintf("%s=%q", device.ArchivesMetaKey, v)
	}
	agentA.Wait(t, "client B's node metadata to list "+group, releaseTimeout, func() (bool, string) { return listed(agentB.NodeID) })
	onA, metaA := listed(agentA.NodeID)
	must.False(t, onA, must.Sprintf("client A holds no archive of the job: %s", metaA))
	step("client B lists %s in its node metadata", group)

	// The same job, placed by the metadata only.
	second := k.run(t, agentA, onArchiveOf(keeperJob("2"), group).HCL())
	must.EqOp(t, agentB.NodeID, second.NodeID, must.Sprint("placed on the node that holds the archive"))
	must.NotNil(t, second.Metrics)
	must.EqOp(t, 1, second.Metrics.NodesFiltered, must.Sprintf("client A filtered out: %+v", second.Metrics))
	must.Eq(t, map[string]int{archivesConstraint(group): 1}, second.Metrics.ConstraintFiltered)
	must.Eq(t, "", archivedFor(t, poolB, parentB+"/.archive", first.ID), must.Sprint("the archive was restored into the slot"))
	step("alloc %s placed on client B by the metadata, with its data", second.ID[:8])

	// A job whose group no node lists: no node is feasible, its
	// evaluation is blocked, and nothing is placed.
	nowhere := keeperJob("1")
	nowhere.ID = "nowhere"
	unlisted := "default/nowhere/g"
	job := agentA.RegisterJob(t, onArchiveOf(nowhere, unlisted).HCL())
	var eval *api.Evaluation
	agentA.Wait(t, "job nowhere's evaluation", jobTimeout, func() (bool, string) {
		e, _, err := agentA.API.Evaluations().Info(job.EvalID, nil)
		if err != nil {
			return false, err.Error()
		}
		eval = e
		return e.Status == api.EvalStatusComplete, fmt.Sprintf("eval %s is %s", e.ID, e.Status)
	})
	failed := eval.FailedTGAllocs["g"]
	must.NotNil(t, failed, must.Sprintf("eval %s: group g placed, though no node lists %s", eval.ID, unlisted))
	must.EqOp(t, 2, failed.NodesEvaluated)
	must.Eq(t, map[string]int{archivesConstraint(unlisted): 2}, failed.ConstraintFiltered)
	must.NotEq(t, "", eval.BlockedEval, must.Sprint("the job waits in a blocked evaluation"))
	blocked, _, err := agentA.API.Evaluations().Info(eval.BlockedEval, nil)
	must.NoError(t, err)
	must.EqOp(t, api.EvalStatusBlocked, blocked.Status)
	allocs, _, err := agentA.API.Jobs().Allocations(job.ID, true, nil)
	must.NoError(t, err)
	must.SliceEmpty(t, allocs, must.Sprint("no allocation of a job whose group no node lists"))
	step("job nowhere unplaced: eval %s blocked, both clients filtered by the constraint", blocked.ID[:8])

	// A client-only agent leaves its tasks running when it stops: stop the
	// jobs first, so that nothing holds pool B when the test ends.
	agentA.StopJob(t, "nowhere", jobTimeout)
	agentA.StopJob(t, "keeper", jobTimeout)
	agentA.Wait(t, "the second allocation's dataset archived", releaseTimeout, func() (bool, string) {
		return archivedFor(t, poolB, parentB+"/.archive", second.ID) != "", "not archived yet"
	})
	archiveA := parentA + "/.archive"
	must.Eq(t, []string{archiveA}, strings.Fields(poolA.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", archiveA)),
		must.Sprint("client A never held the job's data: its archive is empty"))
	// Nor does it remove the directories (and mounts) of its ended
	// allocations: collect them. (The API's GC call answers with an empty
	// body, which its decoder reports as EOF: the wait checks the effect.)
	_ = agentB.API.Nodes().GC(agentB.NodeID, nil)
	allocDir := filepath.Join(agentB.Dir, "data", "alloc")
	agentB.Wait(t, "client B's allocation directories collected", holdTimeout, func() (bool, string) {
		left, err := os.ReadDir(allocDir)
		return err == nil && len(left) == 0, fmt.Sprintf("%d left (%v)", len(left), err)
	})
}
