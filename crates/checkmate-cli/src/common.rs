//! Arguments and helpers shared by the subcommands.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use checkmate_graph::{Budget, Graph};
use checkmate_models::{
    build_training_graph, Costs, Granularity, ImageSize, ModelConfig, Optimizer, TrainingConfig,
};
use checkmate_solver::baselines::CheckpointAll;
use checkmate_solver::{Formulation, SolveOptions};
use clap::{Args, ValueEnum};

/// Where the training graph comes from: a file, or a zoo model built on the fly.
#[derive(Debug, Clone, Args)]
pub struct GraphArgs {
    /// Training graph file (checkmate-graph/1 or networkx node-link JSON).
    #[arg(
        long,
        short = 'g',
        required_unless_present = "model",
        conflicts_with = "model"
    )]
    pub graph: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// A zoo model and how to build its training graph.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Zoo model (vgg16, vgg19, mobilenet, resnet50, unet, fcn8, segnet, mlp, transformer).
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// Batch size (required with --model).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Input image size: 224 or HxW such as 416x608 (default: the model's own).
    #[arg(long)]
    pub image_size: Option<String>,
    /// Number of classes (default: the model's own).
    #[arg(long)]
    pub classes: Option<usize>,
    /// Node costs: `flops` or a measured checkmate-costs/1 file.
    #[arg(long, default_value = "flops")]
    pub costs: String,
    /// Optimizer whose state counts in static memory.
    #[arg(long, value_enum, default_value_t = OptimizerArg::Sgd)]
    pub optimizer: OptimizerArg,
    /// Hidden layers (mlp) or transformer blocks.
    #[arg(long)]
    pub depth: Option<usize>,
    /// Hidden width (mlp), model width (transformer), fc1/fc2 units (vgg16/19) or fc6/fc7
    /// filters (fcn8).
    #[arg(long)]
    pub width: Option<usize>,
    /// Attention heads (transformer).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Sequence length (transformer).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Count per-node kernel workspace in the peak (`false`: only node outputs, Checkmate's
    /// accounting; docs/MODELS.md).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub workspace: bool,
    /// Training-graph nodes: `layer` (one forward and one backward node per layer, Checkmate's
    /// graphs) or `op` (operator level: ReLU masks and pooling indices saved compactly, parameter
    /// gradients apart from input gradients; docs/OP_GRAPHS.md). Default: the granularity a
    /// `--costs` table was measured at; else `layer` for `graph`, `solve` and `sweep`, `op` for
    /// `train`, `max-batch` and `profile` on the CPU (`layer` on CUDA, where the operator-level
    /// kernels do not run yet).
    #[arg(long, value_parser = parse_granularity)]
    pub granularity: Option<Granularity>,
    /// Operator level: a convolution with a ReLU followed by a non-overlapping max pooling (VGG,
    /// U-Net) never holds its output: its forward node keeps only the mask and the pooling's
    /// winners, and the pooling recomputes the convolution at the winners (a quarter of its FLOPs
    /// for 2x2 windows). Less memory, more compute (docs/OP_GRAPHS.md).
    #[arg(long)]
    pub fuse_conv_pool: bool,
    /// Operator level: a standalone ReLU whose input nothing else reads overwrites that input (one
    /// tensor for both). Off by default: it saves no peak on the zoo's graphs and the solvers'
    /// heuristics plan the changed graphs worse (docs/OP_GRAPHS.md).
    #[arg(long)]
    pub relu_in_place: bool,
}

fn parse_granularity(s: &str) -> std::result::Result<Granularity, String> {
    s.parse()
}

/// `--optimizer` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OptimizerArg {
    /// SGD with momentum (one state buffer per parameter).
    Sgd,
    /// Adam (two state buffers per parameter).
    Adam,
}

impl OptimizerArg {
    /// The executor's optimizer at learning rate `lr` (default: 0.01 for SGD, 0.001 for Adam).
    pub fn kind(self, lr: Option<f64>) -> Result<checkmate_executor::OptimizerKind> {
        use checkmate_executor::OptimizerKind;
        let lr = lr.unwrap_or(match self {
            OptimizerArg::Sgd => 0.01,
            OptimizerArg::Adam => 0.001,
        });
        anyhow::ensure!(
            lr.is_finite() && lr > 0.0,
            "--lr {lr}: give a positive learning rate"
        );
        Ok(match self {
            OptimizerArg::Sgd => OptimizerKind::sgd(lr),
            OptimizerArg::Adam => OptimizerKind::adam(lr),
        })
    }
}

/// The granularity a `--costs` table was measured at; `flops` for FLOP costs.
fn granularity_of(costs: &Costs, flops: Granularity) -> Granularity {
    match costs {
        Costs::Measured(table) => table.granularity(),
        Costs::Flops => flops,
    }
}

impl ModelArgs {
    /// The model configuration from the flags.
    pub fn model_config(&self) -> Result<ModelConfig> {
        let model = self.model.as_deref().unwrap_or("?");
        let batch = self.batch.ok_or_else(|| {
            anyhow::anyhow!("--model {model} needs --batch B (examples per batch)")
        })?;
        anyhow::ensure!(batch > 0, "--batch must be at least 1");
        let mut config = ModelConfig::new(batch);
        if let Some(s) = &self.image_size {
            let size: ImageSize = s
                .parse()
                .map_err(|e| anyhow::anyhow!("--image-size {s:?}: {e}; write 224 or 416x608"))?;
            config = config.with_image_size(size);
        }
        config.classes = self.classes;
        config.depth = self.depth;
        config.width = self.width;
        config.heads = self.heads;
        config.seq_len = self.seq_len;
        Ok(config)
    }

    /// The granularity of the commands that run kernels (`train`, `max-batch`, `profile`), fixed
    /// in the flags: `--granularity` when given; else the one a `--costs` table was measured at;
    /// else operator level on the CPU and layer level on CUDA (`device`), where the
    /// operator-level kernels do not run yet.
    pub fn settle_granularity(&mut self, device: &str) -> Result<()> {
        if self.granularity.is_none() {
            let flops = if crate::train_cmd::parse_device(device)?.is_cpu() {
                Granularity::Op
            } else {
                Granularity::Layer
            };
            self.granularity = Some(granularity_of(&self.costs()?, flops));
        }
        Ok(())
    }

    fn costs(&self) -> Result<Costs> {
        Costs::from_arg(&self.costs).with_context(|| format!("cannot use --costs {}", self.costs))
    }

    /// The training configuration from the flags.
    pub fn training_config(&self) -> Result<TrainingConfig> {
        let costs = self.costs()?;
        // `--granularity`, else the one a `--costs` table was measured at, else layer level.
        let granularity = self
            .granularity
            .unwrap_or_else(|| granularity_of(&costs, Granularity::Layer));
        Ok(TrainingConfig {
            optimizer: match self.optimizer {
                OptimizerArg::Sgd => Optimizer::SgdMomentum,
                OptimizerArg::Adam => Optimizer::Adam,
            },
            costs,
            workspace: self.workspace,
            granularity,
            fuse_conv_pool: self.fuse_conv_pool,
            relu_in_place: self.relu_in_place,
        })
    }

    /// Builds the zoo model's training graph.
    pub fn build(&self, name: &str) -> Result<Graph> {
        let graph = build_training_graph(name, &self.model_config()?, &self.training_config()?)
            .with_context(|| format!("cannot build the training graph of model {name:?}"))?;
        Ok(graph)
    }
}

impl GraphArgs {
    /// Loads the graph file or builds the model's graph.
    pub fn load(&self) -> Result<Graph> {
        match (&self.graph, &self.model.model) {
            (Some(path), _) => {
                Graph::read(path).with_context(|| format!("cannot load graph {}", path.display()))
            }
            (None, Some(name)) => self.model.build(name),
            (None, None) => anyhow::bail!("give --graph FILE or --model NAME"),
        }
    }
}

/// A budget resolved against a graph.
#[derive(Debug, Clone, Copy)]
pub struct ResolvedBudget {
    /// Total bytes (static + activations).
    pub total_bytes: u64,
    /// Bytes left for activations.
    pub activation_bytes: u64,
    /// Activation peak of checkpoint-all, the reference for percentages.
    pub checkpoint_all_peak: u64,
}

/// Resolves `budget` for `graph`; a total below static memory is an error.
pub fn resolve_budget(graph: &Graph, budget: Budget) -> Result<ResolvedBudget> {
    let checkpoint_all_peak = CheckpointAll::peak_bytes(graph);
    let total_bytes = budget.total_bytes(graph.static_bytes(), checkpoint_all_peak);
    let activation_bytes = total_bytes.checked_sub(graph.static_bytes()).ok_or(
        checkmate_solver::Error::BelowStatic {
            total_bytes,
            static_bytes: graph.static_bytes(),
        },
    )?;
    Ok(ResolvedBudget {
        total_bytes,
        activation_bytes,
        checkpoint_all_peak,
    })
}

/// Prints one JSON object on stdout as the last line.
pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

/// How the MILP and LP strategies solve (shared by solve, train and max-batch).
#[derive(Debug, Clone, Args)]
pub struct SolverArgs {
    /// Time limit for MILP/LP solves, in seconds (default: none for `milp`; `lp-round` 0.25 s per
    /// node, 8 to 30 s, up to 300 nodes, else 0.02 s per node, 5 to 60 s, without its LP; when
    /// it has found no plan by then, its exact fallback may run to 4 times that, 30 to 120 s).
    #[arg(long)]
    pub time_limit: Option<f64>,
    /// Relative MIP gap at which the MILP stops.
    #[arg(long, default_value_t = 1e-4)]
    pub mip_gap: f64,
    /// Solver threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// MILP formulation.
    #[arg(long, value_enum, default_value_t = FormulationArg::Fast)]
    pub formulation: FormulationArg,
    /// Do not warm-start the MILP with the best heuristic plan.
    #[arg(long)]
    pub no_warm_start: bool,
    /// Memory the exact models may take, HiGHS included (bytes or units, e.g. 2GiB; default:
    /// half the memory the OS reports available). A model estimated to need more is not built:
    /// the strategy answers from its memory-cheap paths and says so.
    #[arg(long)]
    pub solver_memory: Option<String>,
}

/// `--solver-memory`: an amount of bytes (a plain number or with a unit; not a percentage).
fn parse_solver_memory(text: &str) -> Result<u64> {
    match text.parse::<Budget>() {
        Ok(Budget::Bytes(b)) if b > 0 => Ok(b),
        Ok(_) => anyhow::bail!(
            "--solver-memory {text}: give a positive amount of bytes, e.g. 2GiB (not a percentage)"
        ),
        Err(e) => anyhow::bail!("--solver-memory: {e}"),
    }
}

/// `--formulation` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormulationArg {
    /// Our tightened formulation.
    Fast,
    /// The paper's formulation.
    Paper,
}

impl SolverArgs {
    /// Solver options from the flags, with `seed` for randomized rounding.
    pub fn options(&self, seed: u64) -> Result<SolveOptions> {
        let time_limit = match self.time_limit {
            Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
            Some(s) => anyhow::bail!("--time-limit {s}: give a positive number of seconds"),
            None => None,
        };
        Ok(SolveOptions {
            time_limit,
            mip_gap: self.mip_gap,
            threads: self.threads.max(1),
            formulation: match self.formulation {
                FormulationArg::Fast => Formulation::Fast,
                FormulationArg::Paper => Formulation::Paper,
            },
            warm_start: !self.no_warm_start,
            seed,
            memory_limit: self
                .solver_memory
                .as_deref()
                .map(parse_solver_memory)
                .transpose()?,
            incumbents: Vec::new(),
        })
    }
}
