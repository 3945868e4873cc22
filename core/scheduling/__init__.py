"""Which queued job a free worker claims, quotas and fair share, the queue's view, and priority
preemption (the policy and its application)."""
