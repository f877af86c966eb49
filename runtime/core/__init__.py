"""What the engine schedules with: requests and their sequences, the scheduler and its waiting queue, and the
paged KV-cache block manager."""
