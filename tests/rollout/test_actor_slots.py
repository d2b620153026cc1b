"""RolloutPool's Ray bookkeeping (`ActorSlots`): slots per actor, and what an actor's death does when it
was running several rollouts (rollout.rollouts_per_worker > 1)."""

from hymem_train.rollout.pool import REPLACE, RETIRE, SEEN, ActorSlots


def test_every_actor_gets_a_rollout_before_any_gets_a_second():
    free = ActorSlots(3, 2, max_restarts=1).free()
    assert [free.pop() for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_a_death_reported_by_each_of_its_rollouts_counts_once():
    slots = ActorSlots(2, 4, max_restarts=3)
    gen = slots.gens[1]
    # actor 1 ran four rollouts; all four report its death
    verdicts = [slots.died(1, gen) for _ in range(4)]
    assert verdicts == [REPLACE, SEEN, SEEN, SEEN]
    assert slots.deaths == [0, 1] and slots.gens == [0, 1]
    # its replacement dies later: a new death, not the old one seen again
    assert slots.died(1, slots.gens[1]) == REPLACE and slots.deaths[1] == 2


def test_an_actor_past_its_restarts_leaves_the_pool():
    slots = ActorSlots(2, 2, max_restarts=1)
    assert slots.died(0, slots.gens[0]) == REPLACE
    gen = slots.gens[0]
    assert [slots.died(0, gen), slots.died(0, gen)] == [RETIRE, SEEN]
    assert not slots.usable(0) and slots.free() == [1, 1]
