"""Sierra ILS REST API: the change poll, the deletion poll and the bibs/marc export."""
