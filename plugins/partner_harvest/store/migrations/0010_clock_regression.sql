-- A partner clock that went backwards (a reset, a failover to a server a day behind) stamps
-- new versions BEFORE versions we already hold. A run whose partner clock was behind the
-- highest clock an applied run saw, by more than the lag, is marked clock_regressed; its
-- versions carry that clock (regressed_clock) into records and tombstones, so the order of
-- versions stays a function of the two versions alone (I10: any apply order, one outcome).
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS clock_regressed boolean NOT NULL DEFAULT false;
-- The latest stamp among the records a run applied: with the partner clocks runs saw, the
-- yardstick a later run's clock is measured against (a clock behind a stamp it issued went back).
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS max_datestamp timestamptz;
ALTER TABLE records ADD COLUMN IF NOT EXISTS regressed_clock timestamptz;
ALTER TABLE tombstones ADD COLUMN IF NOT EXISTS regressed_clock timestamptz;

-- Is version N newer than version S?  Normally by (datestamp, observed_at). But when one of
-- them was observed by a run whose partner clock had regressed (rc NOT NULL) and the other
-- carries a stamp later than that clock, the later observation wins: the partner's clock
-- went back between the two, so their stamps are not comparable, and what the partner
-- showed last is what it holds. The two exceptions exclude each other (observations).
CREATE OR REPLACE FUNCTION harvest_version_newer(
    n_ds timestamptz, n_obs timestamptz, n_rc timestamptz,
    s_ds timestamptz, s_obs timestamptz, s_rc timestamptz
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN n_rc IS NOT NULL AND s_ds > n_rc AND n_obs > s_obs THEN true
        WHEN s_rc IS NOT NULL AND n_ds > s_rc AND s_obs > n_obs THEN false
        ELSE (n_ds, n_obs) > (s_ds, s_obs)
    END
$$;
